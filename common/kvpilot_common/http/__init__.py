"""The HTTP front door the server and the gateway share (starlette and uvicorn): limits, the
protocol that enforces the header limits, the body reader, the API-key check, the error shape
and how a listener runs and drains."""
