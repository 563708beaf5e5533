"""The node's HTTP API: REST under /v1, its OpenAPI document, and the ASGI app."""

from .app import make_api_app
from .http import HttpError, is_loopback_origin
from .openapi import openapi_document
from .rest import ROUTES, RestApi

__all__ = ["make_api_app", "RestApi", "ROUTES", "openapi_document", "HttpError", "is_loopback_origin"]
