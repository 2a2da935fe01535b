"""Exceptions of the agent SDK. One root, so `except AgentSDKError` catches everything it raises
(tests/sdk/test_errors.py walks the SDK's source and holds every `raise` to it).

    AgentSDKError
     ├── NotConnectedError        the agent is not running, or stopped while waiting to connect
     │    └── LobbyUnreachableError  a lobby URL that cannot work (malformed, a 4xx handshake)
     ├── RegistrationError        the lobby refused REGISTER (e.g. `auth_failed`); not retried
     │    └── AgentIdTakenError   the id is registered under a token this agent does not have
     │         └── TokenRefusedError         the token it resumed with was refused
     ├── ReplacedError            another connection resumed this agent (close 4001); not retried
     ├── LobbyError               the lobby answered with an ERROR (`code` says which)
     ├── MessageRefusedError      an outgoing hook of this agent refused to send the message
     ├── PayloadError             a payload received does not fit the model asked for (ValueError)
     ├── RequestError             a `request()` did not succeed
     │    ├── RemoteError         the RESPONSE had status `error` (`code`, `message`, `payload`)
     │    │    ├── CapabilityNotFoundError   code `capability_not_found`
     │    │    ├── UnauthorizedError         code `unauthorized`
     │    │    ├── InvalidInputError         code `invalid_input`
     │    │    ├── RateLimitedError          code `rate_limited`
     │    │    ├── RemoteTimeoutError        code `timeout` (also a RequestTimeoutError)
     │    │    ├── NoProviderError           code `no_provider` (a `call()` nobody could take)
     │    │    ├── RequestCancelled          code `cancelled`: the requester cancelled it
     │    │    └── (yours)                   `class OutOfStock(RemoteError, code="out_of_stock")`
     │    ├── UnknownReceiverError           the lobby knows no such agent
     │    ├── RequestRefusedError            the lobby refused the REQUEST itself (an ERROR)
     │    ├── RequestTimeoutError            no final RESPONSE in time (also a `TimeoutError`)
     │    └── InputRequiredError             the capability asked for input; no `on_input=`
     ├── DialogueError            a FIPA dialogue did not go as asked
     │    ├── IllegalMoveError    the move breaks a rule of `protocol.fipa` (`rule` names it)
     │    ├── MoveTimeoutError    no move arrived in time (also a `TimeoutError`)
     │    └── DialogueEndedError  the dialogue ended (declined, expired) before what was awaited
     └── CapabilityError          raised BY a capability handler to answer with a chosen code

`CapabilityError` is the one meant to be raised by your code: the handler's RESPONSE then has
status `error` with its `code` and `message`. Any other exception from a handler is answered
with code `internal` and a generic text (the traceback stays in the agent's own log).

A caller catches a remote error by its code as a class: every `RemoteError` subclass declared
with `code=` is what a RESPONSE with that code raises, the SDK's own and an application's alike:

    class OutOfStock(RemoteError, code="out_of_stock"): ...

    try:
        await me.request("shop", "buy", order)
    except OutOfStock as exc:           # the shop raised CapabilityError(..., code="out_of_stock")
        ...

Errors of the caller's own code (a capability declared on a sync function, an agent without
an id, `run()` twice at once) raise `TypeError`, `ValueError` or `RuntimeError` at once, as
Python does: they are bugs to fix, not conditions to handle.
"""

from __future__ import annotations

from typing import Any

from protocol.models import ErrorCode


class AgentSDKError(Exception):
    """Root of every exception the SDK raises."""


class NotConnectedError(AgentSDKError):
    """The agent is not connected and will not be (not started, or stopping)."""


class LobbyUnreachableError(NotConnectedError):
    """A lobby address that cannot work, whatever the retries: a malformed URL, or a server
    that refused the WebSocket handshake with a client error (4xx). Network errors and 5xx
    answers are retried (and move on to the next address) instead."""


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
    """The RESPONSE had status `error` (sent by the capability, or by the lobby on its behalf).

    A subclass declared with `code=` is raised for every error RESPONSE with that code (one
    class per code; a later declaration replaces an earlier one)."""

    def __init_subclass__(cls, *, code: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            _REMOTE_ERRORS[code] = cls

    def __init__(self, code: str, message: str, payload: dict[str, Any] | None = None) -> None:
        super().__init__(with_code(code, message))
        self.code = code
        self.message = message
        self.payload = payload or {}


_REMOTE_ERRORS: dict[str, type[RemoteError]] = {}
"""The class raised for each error code, filled by `RemoteError` subclasses' `code=`."""


class CapabilityNotFoundError(RemoteError, code=ErrorCode.CAPABILITY_NOT_FOUND):
    """The receiver offers no capability of that name."""


class UnauthorizedError(RemoteError, code=ErrorCode.UNAUTHORIZED):
    """This agent may not call the capability (not in its `authorized_requester_ids`, or
    refused by the receiver's policy)."""


class InvalidInputError(RemoteError, code=ErrorCode.INVALID_INPUT):
    """The payload did not validate against the capability's input model."""


class RateLimitedError(RemoteError, code=ErrorCode.RATE_LIMITED):
    """The receiver is over a capability's rate limit, or overloaded: try again later."""


class NoProviderError(RemoteError, code=ErrorCode.NO_PROVIDER):
    """A capability-addressed `call()` found no online agent offering the capability to this
    agent (matching its filters), or none was left after the providers it went to were gone."""


class UnknownReceiverError(RequestError):
    """No agent with that id is registered at the lobby."""


class RequestRefusedError(RequestError):
    """The lobby refused the REQUEST with an ERROR (e.g. `mailbox_full`, `malformed`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(with_code(code, message))
        self.code = code
        self.message = message


class RequestTimeoutError(RequestError, TimeoutError):
    """No final RESPONSE arrived within the timeout."""


class RemoteTimeoutError(RemoteError, RequestTimeoutError, code="timeout"):
    """The capability's own `timeout` passed before its handler finished (code `timeout`)."""


class RequestCancelled(RemoteError, code="cancelled"):
    """The REQUEST was cancelled by its requester (`Agent.cancel`, or the awaiting task was
    cancelled): the lobby's final RESPONSE, code `cancelled`."""


class MessageRefusedError(AgentSDKError):
    """An outgoing hook of this agent refused the message: it was not sent."""


class PayloadError(AgentSDKError, ValueError):
    """A payload received does not fit the pydantic model asked for (a RESPONSE's
    `output_type`, a move's model); `errors` lists pydantic's findings."""

    def __init__(self, message: str, errors: list[Any] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


class DialogueError(AgentSDKError):
    """A FIPA dialogue (`DialogueHandle`) did not go as asked."""


class IllegalMoveError(DialogueError):
    """The move breaks a rule of the FIPA table (`protocol.fipa`); it was not sent. `rule` is
    the rule's stable name (`turn_taking`, `dialogue_over`, ...), the text says why."""

    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(f"{reason} (rule: {rule})")
        self.rule = rule
        self.reason = reason


class MoveTimeoutError(DialogueError, TimeoutError):
    """No move arrived in the dialogue within the timeout."""


class DialogueEndedError(DialogueError):
    """The dialogue ended (`kind`: DECLINE, DIALOGUE_EXPIRED, ...) before what was awaited;
    `reason` is the one a DECLINE gave, if any (also in the message)."""

    def __init__(self, message: str, *, kind: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.reason = reason


class CapabilityError(AgentSDKError):
    """Raise from a capability handler to answer with status `error` and this code and text."""

    def __init__(self, message: str, *, code: str = "error") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def with_code(code: str, message: str) -> str:
    """`code: message`, as an error reads, without saying the code twice when the message
    already opens with it in words (the lobby's `Unauthorized: Agent ...` for `unauthorized`)."""
    words = code.replace("_", " ")
    head, colon, rest = message.partition(": ")
    if colon and head.casefold() == words.casefold():
        message = rest
    return f"{code}: {message}"


def remote_error(payload: dict[str, Any]) -> RemoteError:
    """The exception for an error RESPONSE payload: the class declared for its code, else
    `RemoteError`."""
    code = str(payload.get("code") or "error")
    message = str(payload.get("error") or payload.get("message") or "the request failed")
    return _REMOTE_ERRORS.get(code, RemoteError)(code, message, payload)


def refused_error(code: str, message: str) -> RequestError:
    """The exception for an ERROR the lobby sent about one of our REQUESTs."""
    if code == ErrorCode.UNKNOWN_RECEIVER:
        return UnknownReceiverError(f"{code}: {message}")
    return RequestRefusedError(code, message)


class InputRequiredError(RequestError):
    """The capability asked for input (`input_required`, which `asked` holds) and the call had
    no way to answer: `request()` without `on_input=`. The conversation stays open at the
    lobby, waiting for an INPUT, until the provider's own timeout ends it."""

    def __init__(self, message: str, asked: dict[str, Any]) -> None:
        super().__init__(message)
        self.asked = asked
