"""The gateway's server side of HTTP, hand-written where the stock stack costs too much per request.

- :mod:`router.http.reply`: what the gateway answers, before HTTP framing, and the wait that cancels a
  request's work when its client hangs up;
- :mod:`router.http.request_body`: a request body read from ASGI under the size limit;
- :mod:`router.http.protocol`: uvicorn's httptools protocol with the completion endpoints served from the
  parser callbacks (imports uvicorn's internals: loaded only once :mod:`router.http.uvicorn_compat` found them);
- :mod:`router.http.uvicorn_compat`: the start-up check that the installed uvicorn has those internals.

The client side, to the replicas, is :mod:`router.upstream`.
"""
