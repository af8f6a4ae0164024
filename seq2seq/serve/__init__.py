"""`seq2seq-serve`: trained runs behind a versioned JSON API and one offline page.

    models.py   loading runs and reproduction arms: the only module that imports the
                model side of seq2seq (the Translator, errors)
    schemas.py  the request and response models (pydantic): the OpenAPI schema
    worker.py   the one decoding thread; concurrent requests queue and batch there
    app.py      the FastAPI app: /v1/translate, /v1/models, /v1/health and the page at /
    command.py  the console script: bind the port, load the models, run uvicorn
    static/     index.html, app.js, style.css (no CDN, no build step)

Its settings are ServeConfig in :mod:`seq2seq.config.schema`, checked by
``seq2seq.config.validate_serve`` like every other command's. Importing this package
imports neither torch nor FastAPI.
"""
