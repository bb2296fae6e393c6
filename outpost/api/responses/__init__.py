"""OpenAI's Responses API: `translate` (body -> the pipeline's chat request), `render` (response
objects and streamed events), `routes` (/v1/responses and by id), `store` (finished responses)."""
