"""Kafka: clients with our defaults, topic creation, and the fenced fetcher guard."""
