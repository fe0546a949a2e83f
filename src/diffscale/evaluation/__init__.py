"""Measuring what a trained model generates: probabilistic scores (probabilistic.py) and each
task's evaluation report."""
