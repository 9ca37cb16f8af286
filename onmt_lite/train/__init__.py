"""Training: batching of parallel text, loss, optimizer schedule, the training loop."""
