"""Exceptions of the agent SDK. One root, so `except AgentSDKError` catches everything it raises.

    AgentSDKError
     ├── NotConnectedError        the agent is not running, or stopped while waiting to connect
     ├── RegistrationError        the lobby refused REGISTER (e.g. `auth_failed`); not retried
     │    └── AgentIdTakenError   the id is registered under a token this agent does not have
     │         └── TokenRefusedError         the token it resumed with was refused
     ├── ReplacedError            another connection resumed this agent (close 4001); not retried
     ├── LobbyError               the lobby answered with an ERROR (`code` says which)
     ├── RequestError             a `request()` did not succeed
     │    ├── RemoteError         the RESPONSE had status `error` (`code`, `error`, `payload`)
     │    │    ├── CapabilityNotFoundError   code `capability_not_found`
     │    │    ├── UnauthorizedError         code `unauthorized`
     │    │    └── InvalidInputError         code `invalid_input`
     │    ├── UnknownReceiverError           the lobby knows no such agent
     │    ├── RequestRefusedError            the lobby refused the REQUEST itself (an ERROR)
     │    └── RequestTimeoutError            no final RESPONSE in time (also a `TimeoutError`)
     └── CapabilityError          raised BY a capability handler to answer with a chosen code

`CapabilityError` is the one meant to be raised by your code: the handler's RESPONSE then has
status `error` with its `code` and `message`. Any other exception from a handler is answered
with code `internal` and a generic text (the traceback stays in the agent's own log).
"""

from __future__ import annotations

from typing import Any

from protocol.models import ErrorCode


class AgentSDKError(Exception):
    """Root of every exception the SDK raises."""


class NotConnectedError(AgentSDKError):
    """The agent is not connected and will not be (not started, or stopping)."""


class RegistrationError(AgentSDKError):
    """The lobby refused to register this agent; retrying with the same id would not help."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class AgentIdTakenError(RegistrationError):
    """`agent_id_taken`: the lobby holds this agent id under a token this agent does not have
    (see `agent_sdk.identity` for what to do)."""

    def __init__(self, message: str, *, agent_id: str, source: str | None) -> None:
        super().__init__(ErrorCode.AGENT_ID_TAKEN, message)
        self.agent_id = agent_id
        self.source = source
        """Where the refused token came from (a file, a variable, ...); None if there was none."""


class TokenRefusedError(AgentIdTakenError):
    """The lobby refused the token this agent resumed with (saved, given or from the
    environment): it is not the one the lobby holds for this id."""


class ReplacedError(AgentSDKError):
    """Another connection resumed this agent with its token (close code 4001): another
    process runs the same agent with the same token store. The older one stops."""


class LobbyError(AgentSDKError):
    """The lobby answered a message with ERROR."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RequestError(AgentSDKError):
    """A `request()` did not end in a RESPONSE with status `success`."""


class RemoteError(RequestError):
    """The RESPONSE had status `error` (sent by the capability, or by the lobby on its behalf)."""

    def __init__(self, code: str, message: str, payload: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.payload = payload or {}


class CapabilityNotFoundError(RemoteError):
    """The receiver offers no capability of that name."""


class UnauthorizedError(RemoteError):
    """This agent is not in the capability's `authorized_requester_ids`."""


class InvalidInputError(RemoteError):
    """The payload did not validate against the capability's input model."""


class UnknownReceiverError(RequestError):
    """No agent with that id is registered at the lobby."""


class RequestRefusedError(RequestError):
    """The lobby refused the REQUEST with an ERROR (e.g. `mailbox_full`, `malformed`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RequestTimeoutError(RequestError, TimeoutError):
    """No final RESPONSE arrived within the timeout."""


class CapabilityError(AgentSDKError):
    """Raise from a capability handler to answer with status `error` and this code and text."""

    def __init__(self, message: str, *, code: str = "error") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_REMOTE_ERRORS: dict[str, type[RemoteError]] = {
    ErrorCode.CAPABILITY_NOT_FOUND: CapabilityNotFoundError,
    ErrorCode.UNAUTHORIZED: UnauthorizedError,
    ErrorCode.INVALID_INPUT: InvalidInputError,
}


def remote_error(payload: dict[str, Any]) -> RemoteError:
    """The exception for an error RESPONSE payload."""
    code = str(payload.get("code") or "error")
    message = str(payload.get("error") or payload.get("message") or "the request failed")
    return _REMOTE_ERRORS.get(code, RemoteError)(code, message, payload)


def refused_error(code: str, message: str) -> RequestError:
    """The exception for an ERROR the lobby sent about one of our REQUESTs."""
    if code == ErrorCode.UNKNOWN_RECEIVER:
        return UnknownReceiverError(f"{code}: {message}")
    return RequestRefusedError(code, message)
