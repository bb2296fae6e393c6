"""OpenAI's APIs: chat and text completions (streamed or not), models, embeddings.

`routes` parses the bodies, `handlers` runs them through the pipeline, `render` and `streaming`
shape the replies as OpenAI's objects and server-sent chunks.
"""
