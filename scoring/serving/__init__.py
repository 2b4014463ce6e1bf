"""Online: the scoring worker and what it ranks a micro-batch with."""
