//! Which connection of an MC/S session the commands of one caller's task
//! go on, whatever the session's scheduling (`iscsi attach`'s ublk queues,
//! each kept on one connection).

tokio::task_local! {
    pub(super) static CONNECTION_AFFINITY: usize;
}

/// Runs `future` with the commands it issues sent on connection `index`
/// (modulo their session's connection count; the next live one if that
/// one is down) whatever the session's
/// [`Scheduling`](crate::config::Scheduling). A caller with queues
/// of its own (`iscsi attach`'s ublk queues) keeps each queue on one
/// connection of an MC/S session: a queue's commands then share one
/// connection's window and order, and the queues' connections run side by
/// side. (A plain fn returning the scope's future, not an async fn: that
/// would hold `future` twice, as its argument and inside the scope, and
/// every request's future would be twice the size to build and move.)
pub fn with_connection_affinity<F: std::future::Future>(
    index: usize,
    future: F,
) -> impl std::future::Future<Output = F::Output> {
    CONNECTION_AFFINITY.scope(index, future)
}
