//! Helpers shared by the agent's unit tests.

/// Lets every task that can run, run, without moving the (paused) clock.
pub async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}
