"""onmt_lite serve: a translation server with OpenNMT-py's and LibreTranslate's HTTP APIs.

    onmt_lite serve -model data/multi30k_en_de_raw.pt -src_lang en -tgt_lang de -port 5000
    onmt_lite serve -config conf.json -port 5000      # OpenNMT-py's server conf.json
    onmt_lite serve -argos_packages DIR -port 5000   # every Argos Translate package in DIR

With -model or -argos_packages, every other translate.py decoding option (-beam_size, -n_best,
-search, ...) becomes the models' default.
"""
import argparse
import logging
import signal
import sys

from onmt_lite.errors import OptionError
from onmt_lite.options import Parser, add, integer, number, parse_with_config


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="onmt_lite serve", description=__doc__.split("\n\n")[0] + " With "
                    "-model, every other translate.py decoding option (-beam_size, -n_best, "
                    "-search, ...) becomes the model's default.")
    g = parser.add_argument_group("Models (one of)")
    add(g, "model", help="one checkpoint (onmt_lite or OpenNMT-py) or Marian folder")
    add(g, "config", help="OpenNMT-py server conf.json: models_root, models [{id, model, opt, "
                          "tokenizer, timeout, on_timeout, load, src_lang, tgt_lang}]")
    add(g, "argos_packages", help="a folder of Argos Translate packages (LibreTranslate's: "
        "installed package folders and .argosmodel files): each is served, its languages from "
        "its metadata.json, loaded at its first request")
    add(g, "src_lang", help="-model: its source language code (LibreTranslate's API routes by "
                            "language pair; a Marian folder named *-en-de gives en, de)")
    add(g, "tgt_lang", help="-model: its target language code")
    g = parser.add_argument_group("Server")
    add(g, "host", default="127.0.0.1", help="address to bind (0.0.0.0: every interface)")
    add(g, "port", type=integer(0, 65535), default=5000)
    add(g, "lanes", type=integer(0), default=0,
        help="lane processes of the server, shared by all its models: batches decoded at the "
             "same time, each lane on one torch thread (0: one per core)")
    add(g, "batch_size", type=integer(1), default=32, help="sentences per batch at most")
    add(g, "batch_wait", type=number(0), default=0.01,
        help="seconds sentences wait for a fuller batch under load (with every lane free and "
             "no request on its way, none)")
    add(g, "max_batches", type=integer(0), default=0,
        help="batches a lane decodes at once, joining one search between its steps (1: a "
             "batch that starts waits for the lane's batch to end; 0: 4 where the model's "
             "search takes sentences between its steps, else 1)")
    add(g, "head_start", type=number(0), default=0.5,
        help="seconds a batch of short sentences that arrives beside long ones (at most half "
             "as long as each) steps alone first")
    add(g, "max_queue", type=integer(1), default=1024,
        help="sentences waiting per model; beyond, 503 with Retry-After")
    add(g, "max_request_bytes", type=integer(0), default=1 << 20,
        help="larger request bodies get 413 (0: no limit)")
    add(g, "max_file_bytes", type=integer(1), default=1 << 20,
        help="bytes of a file sent to /translate_file at most; beyond, 413 (the body also "
             "counts against -max_request_bytes)")
    add(g, "max_stored_files", type=integer(1), default=256,
        help="translated files waiting for their download at most (the oldest dropped beyond)")
    add(g, "max_connections", type=integer(0), default=512,
        help="requests in flight at most; beyond, 503 with Retry-After (0: no limit)")
    add(g, "backlog", type=integer(1), default=2048,
        help="connections the kernel holds for the server to accept (capped by "
             "net.core.somaxconn)")
    add(g, "max_sentences", type=integer(1), default=128, help="texts per request at most")
    add(g, "max_chars", type=integer(1), default=5000, help="characters per text at most")
    add(g, "timeout", type=number(above=0), default=60.0,
        help="seconds a request waits for its translations; then 503")
    add(g, "drain_timeout", type=number(above=0), default=25.0,
        help="on SIGTERM, seconds to finish the requests in flight before exiting")
    add(g, "api_keys", help="file of API keys, one a line: then every translation request "
                            "needs one (LibreTranslate: the api_key field; /translator/: "
                            "?api_key= or the X-API-Key header)")
    add(g, "admin_keys", help="file of keys, one a line, for clone_model, unload_model and "
                              "to_cpu (?api_key= or X-API-Key); with -api_keys only, those "
                              "endpoints take the API keys")
    g = parser.add_argument_group("Limits on models and their searches")
    add(g, "max_models", type=integer(1), default=8,
        help="models held at most, the configured ones and clones (never fewer than the "
             "configured ones)")
    add(g, "max_beam_size", type=integer(1), default=64,
        help="beam_size (and n_best) a model's options may set at most")
    add(g, "max_target_length", type=integer(1), default=1024,
        help="max_length a model's options may set at most")
    add(g, "max_batch_size", type=integer(1), default=256,
        help="batch_size a model's options may set at most")
    add(g, "lane_memory", type=integer(1), default=2048,
        help="MiB of search memory one request may need in a lane; a request, clone or model "
             "that needs more is refused naming this limit")
    add(g, "max_memory", type=integer(0), default=None,
        help="MiB the models loaded may hold (each: its weights once, shared by the lanes, and "
             "a quarter of them in each lane); the least recently used are unloaded to make "
             "room, and load again at their next request (default: half the machine's memory; "
             "0: no bound)")
    return parser


def _specs(args, rest):
    """The models to serve, from -config, or from -model or -argos_packages and translate.py
    options ``rest``."""
    from onmt_lite.serve.config import (
        ModelSpec,
        check_opt,
        guess_languages,
        read_argos_packages,
        read_conf,
    )
    from onmt_lite.translate.flags import build_parser as translate_parser
    sources = [name for name in ("config", "model", "argos_packages") if getattr(args, name)]
    if len(sources) != 1:
        raise OptionError("give one of -model (one model), -argos_packages (a folder of Argos "
                          "Translate packages) or -config (OpenNMT-py's conf.json)")
    if args.config:
        if rest:
            raise OptionError("-config names the models and their options: give no "
                              f"translate options ({' '.join(rest)})")
        return read_conf(args.config)
    parser = translate_parser()
    parser.prog = "onmt_lite serve"  # its errors name this command
    parsed = parse_with_config(parser, ["-model", args.model or args.argos_packages, "-src", "-"]
                               + rest)
    given = {name: getattr(parsed, name) for name in parsed.given_options
             if name not in ("model", "src")}  # an option given at its default value counts
    opt = check_opt(given, "onmt_lite serve", command_line=True)
    if args.argos_packages:
        return read_argos_packages(args.argos_packages, opt)
    src_lang, tgt_lang = args.src_lang, args.tgt_lang
    if src_lang is None and tgt_lang is None:
        src_lang, tgt_lang = guess_languages(args.model)
    return [ModelSpec(0, args.model, opt, src_lang, tgt_lang, user_opt=dict(opt), load=True)]


def _keys(path):
    """The keys of a file, one a line (None: no file given)."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            keys = {line.strip() for line in f if line.strip()}
    except OSError as err:
        raise OptionError(f"{path}: cannot read: {err.strerror}") from None
    if not keys:
        raise OptionError(f"{path}: holds no key")
    return keys


def _raise_open_files() -> None:
    """Raises the process's soft limit on open files to its hard limit: each connection holds
    one, and the common soft limit of 1,024 would refuse connections long before -backlog or
    -max_connections."""
    try:
        import resource
    except ImportError:  # not on this system
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError) as err:
        logging.getLogger("onmt_lite").warning("open files stay at %d (%s)", soft, err)


def main(argv=None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s %(levelname)s] %(message)s")
    try:
        import uvicorn  # noqa: F401 - the serve extra

        from onmt_lite.serve.app import create_app
        from onmt_lite.serve.batcher import Scheduling
        from onmt_lite.serve.limits import Limits, SearchLimits, default_max_memory
        from onmt_lite.serve.models import Registry, default_lanes
    except ImportError as err:
        print(f"onmt_lite serve: error: {err.name} is missing: pip install 'onmt_lite[serve]'",
              file=sys.stderr)
        return 1
    try:
        specs = _specs(args, rest)
        keys, admin_keys = _keys(args.api_keys), _keys(args.admin_keys)
        lanes = args.lanes or default_lanes()
        max_memory = default_max_memory() if args.max_memory is None else args.max_memory
        search_limits = SearchLimits(args.max_beam_size, args.max_target_length,
                                     args.max_batch_size, args.lane_memory, args.max_models,
                                     max_memory)
        search_limits.check_batch_size(args.batch_size, "the command line")
        registry = Registry(specs, Scheduling(lanes, args.batch_size, args.max_queue,
                                              args.batch_wait, args.max_batches,
                                              args.head_start), search_limits)
    except OptionError as err:
        print(f"onmt_lite serve: error: {err}", file=sys.stderr)
        return 2
    limits = Limits(args.max_request_bytes, args.max_sentences, args.max_chars, args.timeout,
                    args.max_queue, args.max_connections, args.max_file_bytes,
                    args.max_stored_files)
    app = create_app(registry, limits, keys, admin_keys)
    _raise_open_files()
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                            timeout_graceful_shutdown=args.drain_timeout, backlog=args.backlog)
    server = uvicorn.Server(config)
    # uvicorn handles SIGTERM and SIGINT while it runs (stop accepting, finish the requests in
    # flight), then raises the signal again to the handler it found: make that one a no-op, so a
    # drained server exits with status 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
