# shellcheck shell=bash
# Every script of iscsi-rs that runs under `set -e` sources this right after `set -euo pipefail`,
# so that a run that stops on an error always says where and why: the file and line, the command,
# its exit status, and the calls that led there. Without it `set -e` ends a script silently, and a
# script whose output is thrown away (`build-image >/dev/null`) takes its caller down without a
# word (issue 33: scripts/test exited 2 and printed nothing).
#
#   set -euo pipefail
#   source "$(dirname "$0")/lib/on-error.sh"     # or the path from wherever the script lives
#
# What it prints, on stderr, once per level that stops (a subshell, then the script around it):
#   build-image: stopped at tests/linux-vm/build-image:28: `sed -n ... stamp` exited with status 2
#     in stamp_kernel, called from tests/linux-vm/build-image:29
#
# The ERR trap is inherited by functions, command substitutions and subshells (errtrace), but it
# only speaks where errexit is in force: a command that fails under `|| true`, in an `if`, or
# inside a `$(...)` that does not inherit `set -e`, is the script's own business and stays quiet.
# A trap the script sets on ERR itself replaces this one (none does today).

set -o errtrace

# on_error_report STATUS COMMAND PIPESTATUS: the ERR trap's body (a function, so that the trap line
# stays short and the caller's frames are BASH_SOURCE[1...]).
on_error_report() {
    local status=$1 command=$2 pipe=$3 i
    case $- in
        *e*) ;;
        *) return 0 ;;
    esac
    local where="${BASH_SOURCE[1]:-?}:${BASH_LINENO[0]:-?}"
    # One line for the command, however long the pipeline or the heredoc it came from.
    command=${command//$'\n'/ }
    ((${#command} <= 200)) || command="${command:0:200}..."
    local detail="exited with status $status"
    # A pipeline under pipefail: the statuses of its parts say which one failed.
    [[ $pipe == *' '* ]] && detail+=" (pipeline statuses: $pipe)"
    echo "${0##*/}: stopped at $where: \`$command\` $detail" >&2
    # The calls that led here, innermost first (FUNCNAME[0] is this function; "main" ends the list).
    for ((i = 1; i < ${#FUNCNAME[@]} - 1; i++)); do
        echo "  in ${FUNCNAME[$i]}, called from ${BASH_SOURCE[$((i + 1))]:-?}:${BASH_LINENO[$i]:-?}" >&2
    done
}

trap 'on_error_report "$?" "$BASH_COMMAND" "${PIPESTATUS[*]}"' ERR
