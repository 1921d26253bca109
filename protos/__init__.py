"""The gRPC contract: .proto sources and generated stubs (built with the controller issue)."""
