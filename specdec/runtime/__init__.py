"""What every service runs on: flags = env variables, gRPC start-up and interceptors, who may call, metrics, tracing."""
