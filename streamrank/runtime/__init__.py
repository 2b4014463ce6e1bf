"""The worker runtime every group worker stands on: lifecycle helpers, health, the metrics server, the group registry, logging and task handling."""
