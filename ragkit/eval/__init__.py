"""Evaluation: labelled sets, batch runs, metrics and reports (see eval/README.md)."""
