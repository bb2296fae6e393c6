"""llama-server's own routes: /completion (`completion`, `schemas`, `render`), /infill, /props and
/slots, slot files, reranking, /tokenize and friends (`routes`), and its `llamacpp:*` metrics."""
