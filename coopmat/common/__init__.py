"""What every layer shares: errors, the element-type table, GGUF block formats, the cache
directory and a small LRU."""
