"""OpenAI's Responses API (/v1/responses) over the chat core, with its bounded response store."""
