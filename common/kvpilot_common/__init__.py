"""What kvpilot's sides share, torch-free: metric names and label values, precision and the
memory model, parallelism, demand, termination reasons, errors and the HTTP error shape, the
ModelDeployment's names, the pod's port, reading Prometheus text, and the HTTP front door's
limits, key check and body reader (http/, which needs starlette and uvicorn).

The server, the operator, the gateway and the load tester import this package and never each
other (tests/test_packaging.py enforces it). Its top-level modules need only the standard
library unless they say otherwise, so the base install runs the CLI and `kvpilot plan`."""
