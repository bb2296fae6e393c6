"""The broker connection both sides share: connecting (connect), rebuilding after a loss (session), the
queues, exchanges and policies on the broker (topology) and the one publish-and-retry (publish)."""
