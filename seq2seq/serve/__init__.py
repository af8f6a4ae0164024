"""`seq2seq-serve`: trained runs behind a versioned JSON API and one offline page.

    config.py   ServeConfig (the Hydra schema) and its checks
    models.py   loading runs and reproduction arms: the only module that imports the
                rest of seq2seq (translate, ensemble, checkpoint, errors)
    schemas.py  the request and response models (pydantic): the OpenAPI schema
    worker.py   the one decoding thread; concurrent requests queue and batch there
    app.py      the FastAPI app: /v1/translate, /v1/models, /v1/health and the page at /
    command.py  the console script: bind the port, load the models, run uvicorn
    static/     index.html, app.js, style.css (no CDN, no build step)

Importing this package imports neither torch nor FastAPI.
"""
