"""Training: the recipe, loss (5.4), schedule (5.3), one update, the trainer, the run
directory, validation, checkpoint averaging and the demo."""
