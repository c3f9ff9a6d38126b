"""The service runtime: the bus, the service runner, settings, logs, metrics and dead
letters."""
