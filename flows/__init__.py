"""Prefect flows: they compose tasks and never hold logic of their own."""
