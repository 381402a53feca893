"""Deployment: a plan becomes a running fleet (local processes or Ray actors) registered with the gateway.

``desired`` turns a plan into stable replica ids, ``rollout`` plans and runs a rolling update between two
replica sets, ``local``/``ray_target`` start replicas, ``registry`` writes the gateway's Redis registry,
``controller`` ties them together and ``daemon`` runs a controller in the background for ``boute deploy``.
"""
