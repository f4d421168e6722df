"""`sitsprobe report`: latency attribution, SLIs and a sampling-bias check
over exported requests.

- :mod:`.records`: one compact :class:`RequestRecord` per request, from an
  OTLP/JSON span or from the agent's own Request;
- :mod:`.load`: a traces file (garbage lines counted, never fatal) or a
  running agent, and the time window;
- :mod:`.quantiles`, :mod:`.tables`, :mod:`.bias`: the computations, pure
  functions over records;
- :mod:`.render`: text, JSON and PNG;
- :mod:`.recent`: the agent's bounded store behind ``/report/requests.json``.
"""
from .recent import Recent
from .records import SEGMENTS, RequestRecord
from .tables import Tables, build

__all__ = ["SEGMENTS", "Recent", "RequestRecord", "Tables", "build"]
