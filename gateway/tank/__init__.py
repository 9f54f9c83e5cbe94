"""The Tank listener's parts: one session per connection, its outbox, lane and handlers.

:mod:`gateway.tank.listener` accepts connections and runs a
:class:`~gateway.tank.session.TankSession` for each.
"""
