"""resurge scaler: admits jobs, places their replicas and ends them when they finish."""
