"""Retrieve: find the sections that answer a question and pack them into a budgeted prompt."""
