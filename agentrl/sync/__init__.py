"""Weights from the learner to the engines: bucketed sync with proof, the weight transports to Ray workers, colocated sleep/wake."""
