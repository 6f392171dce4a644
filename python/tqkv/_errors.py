"""One rule for the API's failures: whatever a public call of ``tqkv`` raises is a ``tqkv.Error``.

The library's own errors already are (module.cc maps each StatusCode). What Python or nanobind
raises on a bad argument before the library sees it (TypeError for a wrong type or a read-only
``out=``, OverflowError for ``-1`` into an unsigned count, ValueError, IndexError, KeyError)
becomes ``tqkv.InvalidArgumentError`` (a ValueError too), its message kept and the original as
``__cause__`` (AttributeError too: an argument of the wrong kind). ``public`` applies it to the package's functions and classes (__init__.py).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable, Dict, Iterator, TypeVar

from ._tqkv import Error, InvalidArgumentError

# AttributeError: an argument of the wrong kind (stats=[] has no update()).
_ARGUMENT_ERRORS = (TypeError, ValueError, IndexError, KeyError, OverflowError, AttributeError)

F = TypeVar("F", bound=Callable[..., Any])


def mark_callers(e: BaseException) -> None:
    """Marks an exception raised by the caller's own callback: it propagates unchanged."""
    try:
        e._tqkv_callers = True  # type: ignore[attr-defined]
    except AttributeError:
        pass


def _invalid(e: BaseException) -> InvalidArgumentError:
    return InvalidArgumentError(f"{type(e).__name__}: {e}")


@contextlib.contextmanager
def _argument_errors() -> Iterator[None]:
    """Re-raises an argument error of Python or nanobind as InvalidArgumentError; tqkv.Error and
    what the caller's own callbacks raised pass unchanged."""
    try:
        yield
    except Error:
        raise
    except _ARGUMENT_ERRORS as e:
        if getattr(e, "_tqkv_callers", False):
            raise
        raise _invalid(e) from e


def api(fn: F) -> F:
    """``fn`` with argument errors raised as ``tqkv.InvalidArgumentError`` (generators too)."""
    if getattr(fn, "_tqkv_api", False):
        return fn
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args: Any, **kwargs: Any) -> Any:
            with _argument_errors():
                return (yield from fn(*args, **kwargs))
        wrapped: Any = gen
    else:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            with _argument_errors():
                return fn(*args, **kwargs)
        wrapped = call
    wrapped._tqkv_api = True
    return wrapped


def api_class(cls: type) -> type:
    """Applies ``api`` to a class's constructor, public methods and properties."""
    for name, attr in list(vars(cls).items()):
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(attr, property):
            setattr(cls, name, property(api(attr.fget) if attr.fget else None,
                                        api(attr.fset) if attr.fset else None, None, attr.__doc__))
        elif isinstance(attr, (staticmethod, classmethod)):
            setattr(cls, name, type(attr)(api(attr.__func__)))
        elif inspect.isfunction(attr):
            setattr(cls, name, api(attr))
    return cls


def public(namespace: Dict[str, Any], names: Any) -> None:
    """Applies the rule to every public function and class of a module namespace."""
    for name in names:
        obj = namespace.get(name)
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            api_class(obj)
        elif callable(obj) and not isinstance(obj, type):
            namespace[name] = api(obj)
