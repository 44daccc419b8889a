"""Will the drafter pay off: the pipeline's acceptance forecast and the gates that act on it."""
