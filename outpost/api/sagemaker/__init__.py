"""SageMaker's container contract (GET /ping, POST /invocations with TGI's or OpenAI's bodies)."""
