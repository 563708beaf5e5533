"""The gRPC surface: ``hyphae.v1.Memory`` (``hyphae/v1/memory.proto``) over the one core."""

from .server import RPCS, SERVICE_NAME, GrpcSurface

__all__ = ["RPCS", "SERVICE_NAME", "GrpcSurface"]
