"""Real-world workload: a Django 5.2 app served by Django's own threaded development server
(one thread per request, as `manage.py runserver` serves) — issue 17.

Usage: python django_app.py READY_FILE

Settings are configured in this file (no project directory). `/` renders a template that loops
over a list of rows through a few nested Python helpers: CPU work in the request thread. The
server listens on 127.0.0.1 at a free port; the ready file (JSON: `pid`, `port`, `version`) is
written once it accepts connections. Requests are logged nowhere.
"""

import json
import os
import sys
import threading

import django
from django.conf import settings

settings.configure(
    DEBUG=False,
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    SECRET_KEY="pyebpf-e2e",
    MIDDLEWARE=[],
    INSTALLED_APPS=[],
    TEMPLATES=[
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "OPTIONS": {"string_if_invalid": "", "debug": False},
        }
    ],
    LOGGING_CONFIG=None,
)
django.setup()

from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.template import Context, Engine  # noqa: E402
from django.urls import path  # noqa: E402

PAGE = Engine.get_default().from_string(
    """<table>{% for row in rows %}<tr class="{% cycle 'odd' 'even' %}">
{% for cell in row.cells %}<td>{{ cell.name|title }}: {{ cell.value|floatformat:2 }}</td>{% endfor %}
<td>{{ row.total|floatformat:1 }}</td></tr>{% endfor %}</table>"""
)


def cell(i, j):
    return {"name": f"cell {i}-{j}", "value": (i * 31 + j * 17) % 97 / 7}


def row(i):
    cells = [cell(i, j) for j in range(8)]
    return {"cells": cells, "total": sum(c["value"] for c in cells)}


def rows(n):
    return [row(i) for i in range(n)]


def index(request):
    return HttpResponse(PAGE.render(Context({"rows": rows(60)})))


urlpatterns = [path("", index)]


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def main():
    ready = sys.argv[1]
    httpd = ThreadedWSGIServer(("127.0.0.1", 0), QuietHandler, ipv6=False)
    httpd.set_app(get_wsgi_application())
    tmp = ready + ".tmp"
    with open(tmp, "w") as f:
        json.dump(
            {
                "pid": os.getpid(),
                "port": httpd.server_address[1],
                "version": "%d.%d.%d" % sys.version_info[:3],
                "main_native_id": threading.get_native_id(),
            },
            f,
        )
    os.rename(tmp, ready)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
