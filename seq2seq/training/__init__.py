"""Training: set-up, the loop, validation on dev, optimizers and schedules, torchrun, signals."""
