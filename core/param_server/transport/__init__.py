"""How weight bytes travel: the gRPC chunk codec, the bulk lane, relays between workers."""
