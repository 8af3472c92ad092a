"""`kvpilot gateway`: one OpenAI-compatible endpoint for every ModelDeployment it watches."""
