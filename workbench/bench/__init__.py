"""Every benchmark (``streamrank bench NAME``) and the load generator; each measures its baseline in the same run."""
