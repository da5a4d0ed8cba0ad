"""String formats and bounded scalar types every part of the API shares.

Kept apart from the models so that the TrainingJob spec and the worker pod template can both
use them without importing each other. Each pattern has a hint in ``PATTERN_HINTS`` because a
regex is not an explanation: parse errors quote the hint, not the regex.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import StringConstraints

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
QUANTITY = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]i?|Ki)?$"
SIZE = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]i?|Ki)?$"
POSITIVE_SIZE = (
    r"^([0-9]*[1-9][0-9]*(\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)([eE][+-]?[0-9]+|[numkMGTPE]i?|Ki)?$"
)
"""``SIZE`` without zero: a digit 1-9 somewhere in the number."""
URI = r"^[a-z][a-z0-9+.-]*://.+$"
GPU_TYPE = r"^[A-Za-z0-9][-A-Za-z0-9_.]*$"
ABSOLUTE_PATH = r"^/"

PATTERN_HINTS = {
    DNS_LABEL: "a DNS label: lowercase letters, digits and '-'",
    DNS_SUBDOMAIN: "a DNS name: lowercase letters, digits, '-' and '.'",
    ENV_NAME: "an environment variable name: letters, digits, '_', '-', '.', not a digit first",
    QUANTITY: "a Kubernetes quantity such as 500m, 2, 4Gi",
    SIZE: "a size as a Kubernetes quantity without a sign, such as 512Mi, 1Gi or 0",
    POSITIVE_SIZE: "a size above zero as a Kubernetes quantity, such as 512Mi or 20Gi",
    URI: "a URI with a scheme, such as s3://bucket/prefix",
    GPU_TYPE: "a GPU type: letters, digits, '-', '_', '.' (e.g. H100, NVIDIA-A100-SXM4-80GB)",
    ABSOLUTE_PATH: "an absolute path (starting with /)",
}
"""What each pattern means, for error messages: a regex is not an explanation."""

ShortText = Annotated[str, StringConstraints(min_length=1, max_length=253)]
Arg = Annotated[str, StringConstraints(max_length=4096)]
GpuTypeName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=GPU_TYPE)]
Quantity = Annotated[str, StringConstraints(max_length=64, pattern=QUANTITY)]
Size = Annotated[str, StringConstraints(max_length=64, pattern=SIZE)]
PositiveSize = Annotated[str, StringConstraints(max_length=64, pattern=POSITIVE_SIZE)]
ResourceName = Annotated[str, StringConstraints(min_length=1, max_length=253)]
DnsLabel = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL)]
DnsName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=ENV_NAME)]


def is_zero_size(size: str) -> bool:
    """Whether a ``SIZE`` quantity is zero (``0``, ``0Gi``, ``0.0``): it switches a volume off."""
    number = re.sub(r"[^0-9.].*$", "", size)
    return not number.strip("0.")
