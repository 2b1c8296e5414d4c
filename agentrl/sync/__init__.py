"""Weights from the learner to the engines: bucketed sync with proof, Ray broadcast groups, colocated sleep/wake."""
