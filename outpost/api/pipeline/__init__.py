"""The request pipeline every generating route shares, whatever protocol it speaks.

parse (`schemas`, `tool_schemas`: the request bodies) -> validate and map to a `GenerateRequest`
(`mapping`) -> render the chat prompt (`chat_plan`) -> context, limits and submit to the
`InferenceBackend` (`submit`) and read its events (`generation`; `chat_run` for every API that
speaks chat) -> frame the stream (`sse`: SSE and NDJSON, every protocol's events). `embed` is the
same for the embedding routes. Protocol packages beside this one (openai, anthropic, responses,
llama, sagemaker, ollama) translate their own bodies into these pieces and the pieces' results into
their own replies and error envelopes.
"""
