"""Several engines behind one server, each a Ray actor in a process of its own, behind one `EngineCore`."""
