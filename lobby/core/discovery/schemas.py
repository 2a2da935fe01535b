"""Capabilities' input schemas: compiled once when declared, checked on every REQUEST to them.

What is validated is a REQUEST's **arguments**: its payload without `capability_name`, the
object an SDK handler receives. Call `check_input_schemas` before a REGISTER or an
UPDATE_CAPABILITIES changes anything: a schema that does not compile, or that requires
`capability_name`, refuses the whole declaration (`malformed`). `input_check` then gives each
capability its compiled check, or `None` when the schema accepts any object (`{}`, the default,
and `{"type": "object"}`), so a REQUEST to such a capability costs one attribute lookup.

Schemas are JSON Schema, draft 2020-12 unless their `$schema` names another, compiled by
jsonschema-rs without network or file access (a `$ref` outside the schema is refused), and with
a backtracking limit for the patterns that need one (lookaround, backreferences). `format` is
an annotation, not checked, as draft 2020-12 has it. Identical schemas (many agents of one kind)
share one compiled validator.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any, Final

import jsonschema_rs
import orjson
import structlog

from lobby.core.refusal import Refusal
from protocol.models import ErrorCode
from protocol.payloads import Capability

log = structlog.get_logger("lobby")

COMPILED_MAX: Final = 1024
"""Distinct compiled schemas kept for reuse (one evicted stays alive in the capabilities that
use it)."""
SHARED_MAX_BYTES: Final = 16 * 1024
"""Schemas longer than this (as JSON) are compiled for each capability, not kept for reuse:
bounds what the reuse cache can hold."""
BACKTRACK_LIMIT: Final = 10_000
"""Backtracking steps a pattern may take on one value before the value counts as not matching:
bounds what one REQUEST can cost (a catastrophic pattern on 20 KB took 2.6 ms at the library's
default of 1,000,000, 0.45 ms at this)."""
REASON_MAX: Final = 200
"""Characters of one schema error kept in a refusal (an error quotes the offending value)."""
REPORTED_MAX: Final = 3
"""Errors named in one refusal."""

_ANY_OBJECT: Final = (b"{}", b'{"type":"object"}')
_ANNOTATIONS: Final = frozenset({"title", "description", "$comment", "examples", "default"})


@dataclass(frozen=True, slots=True)
class InvalidInput:
    """Why a REQUEST's arguments were refused: where (a JSON Pointer, `""` for the arguments
    themselves) and the errors, as one sentence."""

    path: str
    reason: str

    def sentence(self, capability: str, agent_id: str) -> str:
        where = f"at {self.path}" if self.path else "at the top level"
        call = f"capability '{capability}' on agent '{agent_id}'"
        return f"Invalid input for {call} {where}: {self.reason}"


class InputCheck:
    """A capability's compiled input schema. Call `invalid` with a REQUEST's payload."""

    __slots__ = ("_validator",)

    def __init__(self, validator: jsonschema_rs.Validator) -> None:
        self._validator = validator

    @property
    def key(self) -> object:
        """The same for every capability with an identical schema (they share one compiled
        validator): what a verdict on one REQUEST's arguments may be cached under."""
        return self._validator

    def invalid(self, payload: dict[str, Any]) -> InvalidInput | None:
        """Why the payload's arguments break the schema, or `None` if they fit."""
        # The arguments are the payload less `capability_name`. A shallow copy without it costs
        # about 0.2 us against 0.7 us for validating a five-field object. Compiling the schema
        # so that it allows `capability_name` would save the copy, but JSON Schema cannot say
        # "ignore this key" in general (`$ref: "#"` in a nested object, `propertyNames`,
        # `maxProperties`, `unevaluatedProperties`...), so the copy is the exact way.
        arguments = dict(payload)
        arguments.pop("capability_name", None)
        validator = self._validator
        if validator.is_valid(arguments):
            return None
        errors = list(itertools.islice(validator.iter_errors(arguments), REPORTED_MAX))
        first = pointer(errors[0].instance_path)
        reasons = [_clip(errors[0].message)]
        reasons += [
            f"at {pointer(e.instance_path) or 'the top level'}: {_clip(e.message)}"
            for e in errors[1:]
        ]
        return InvalidInput(first, "; ".join(reasons))


def check_input_schemas(capabilities: list[Capability] | None) -> None:
    """Refuse (`malformed`) a declaration with an input schema that does not compile or that
    requires `capability_name`, naming the capability and the problem. Call before anything is
    changed."""
    for capability in capabilities or ():
        schema = capability.input_schema
        try:
            _compiled(schema)
        except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as e:
            raise Refusal(
                ErrorCode.MALFORMED,
                f"capability {capability.name!r}: input_schema is not a valid JSON Schema: "
                f"{_schema_problem(e)}",
            ) from None
        # A schema written for the whole payload would refuse every REQUEST: say so now.
        if "capability_name" in (schema.get("required") or ()):
            raise Refusal(
                ErrorCode.MALFORMED,
                f"capability {capability.name!r}: input_schema requires 'capability_name', "
                "but it describes a REQUEST's arguments, its payload without 'capability_name'",
            )


def input_check(capability: Capability) -> InputCheck | None:
    """The check REQUESTs to `capability` go through, or `None` if its schema accepts any
    object. Never raises: a schema that does not compile (stored before the lobby checked
    schemas) is logged and not enforced."""
    schema = capability.input_schema
    try:
        validator = _compiled(schema)
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as e:
        log.warning(
            "INPUT_SCHEMA_NOT_ENFORCED", capability=capability.name, problem=_schema_problem(e)
        )
        return None
    if validator is None or _accepts_any_object(schema):
        return None
    return InputCheck(validator)


def pointer(path: list[str | int]) -> str:
    """The JSON Pointer (RFC 6901) of an instance path; `""` is the arguments themselves."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _compiled(schema: dict[str, Any]) -> jsonschema_rs.Validator | None:
    canonical = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    if canonical == b"{}":
        return None
    if len(canonical) > SHARED_MAX_BYTES:
        return _compile(canonical)
    return _shared(canonical)


def _compile(canonical: bytes) -> jsonschema_rs.Validator:
    # `validator_for` checks the schema against its draft's meta-schema; `offline` refuses any
    # `$ref` it would have to fetch (the core does no I/O, and an agent must not make the
    # lobby open URLs or files).
    return jsonschema_rs.validator_for(
        canonical.decode(),
        offline=True,
        pattern_options=jsonschema_rs.FancyRegexOptions(backtrack_limit=BACKTRACK_LIMIT),
    )


_shared = functools.lru_cache(maxsize=COMPILED_MAX)(_compile)


def _accepts_any_object(schema: dict[str, Any]) -> bool:
    """True for a schema (known to compile) that no object can fail: nothing but annotations,
    `"type": "object"` and no `properties` (an SDK model without fields). REQUEST arguments are
    always an object."""
    rest = {k: v for k, v in schema.items() if k not in _ANNOTATIONS}
    if rest.get("properties") == {}:
        del rest["properties"]
    return orjson.dumps(rest, option=orjson.OPT_SORT_KEYS) in _ANY_OBJECT


def _schema_problem(error: Exception) -> str:
    if isinstance(error, jsonschema_rs.ValidationError):
        where = pointer(error.instance_path)
        problem = _clip(error.message.splitlines()[0] if error.message else str(error))
        return f"{problem} (at {where})" if where else problem
    return _clip(str(error).splitlines()[0] if str(error) else type(error).__name__)


def _clip(text: str) -> str:
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


@dataclass(slots=True)
class CapabilityEntry:
    """A capability as the router uses it: the model, who may call it, its wire form and its
    compiled input schema."""

    model: Capability
    allowed: frozenset[str] | None
    """`None` when public (`authorized_requester_ids` null or empty)."""
    wire: dict[str, Any]
    size: int
    """Bytes of `wire` as JSON: what it adds to a DISCOVER answer, which is bounded."""
    input_check: InputCheck | None
    """`None` when the input schema accepts any object (see lobby.core.discovery.schemas)."""

    @classmethod
    def of(cls, capability: Capability) -> CapabilityEntry:
        ids = capability.authorized_requester_ids
        # What DISCOVER shows: a field left unset is left out, never a null list or map.
        wire = capability.model_dump(mode="json", exclude_none=True)
        return cls(
            capability,
            frozenset(ids) if ids else None,
            wire,
            len(orjson.dumps(wire)),
            input_check(capability),
        )
