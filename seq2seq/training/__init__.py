"""Training: set-up, the loop, validation on dev, optimizers, precision, torchrun, signals."""
