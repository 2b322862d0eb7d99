"""The RL core: group advantages, policy losses, chunked token log-probs."""
