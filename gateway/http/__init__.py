"""The HTTP listener (``listen.http``): produce, fetch, Server-Sent Events, WebSocket and the
web console, over the :class:`~gateway.core.contract.Backend` contract.

HTTP is parsed by h11 and WebSocket frames by wsproto; this package never parses either by
hand. Modules, one job each:

- :mod:`~gateway.http.listener`: the listener (connection slots, TLS, the tails);
- :mod:`~gateway.http.session`: one connection: read a request, route it, answer;
- :mod:`~gateway.http.request`: a request as read, answers and refusals;
- :mod:`~gateway.http.routing`: which handler serves which path;
- :mod:`~gateway.http.messages`: a message as JSON (text as text, the rest base64);
- :mod:`~gateway.http.tail`: one reader of a partition's tail for every live subscriber,
  each message encoded once;
- :mod:`~gateway.http.cursor`: one subscriber's position in a partition;
- :mod:`~gateway.http.produce`, :mod:`~gateway.http.fetch`, :mod:`~gateway.http.topics`,
  :mod:`~gateway.http.sse`, :mod:`~gateway.http.websocket`: the endpoints;
- :mod:`~gateway.http.auth`: bearer tokens (static and JWT) to principals;
- :mod:`~gateway.http.console`: the static files of the web console and the JavaScript
  client; :mod:`~gateway.http.clientjs`: its classic script derived from its module.
"""
