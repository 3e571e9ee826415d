"""Real-broker harness: run RabbitMQ 3.10.8 / 4.0.5 / 4.3.6 on data dirs of our choosing."""

from brokers.harness import NODENAME, Broker, BrokerError, plugins_needed
from brokers.runtimes import RUNTIMES, runtime

__all__ = ["Broker", "BrokerError", "NODENAME", "RUNTIMES", "plugins_needed", "runtime"]
