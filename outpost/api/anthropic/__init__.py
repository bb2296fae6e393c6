"""Anthropic's Messages API: `translate` turns a body into the pipeline's chat request, `routes`
serves /v1/messages and /v1/messages/count_tokens in Anthropic's shapes and error envelope."""
