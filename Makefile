# Shortcuts for the README's commands; each target calls bootstrap.py, which sets up .venv and Java first.
.PHONY: run test lint format doctor

run:        ## set up and run the pipeline on the bundled sample
	python3 bootstrap.py run

test:       ## set up and run the whole test suite
	python3 bootstrap.py test

doctor:     ## check Java, Spark, the lake and PostgreSQL
	python3 bootstrap.py setup && .venv/bin/streamdi doctor

lint:       ## ruff lint + format check
	python3 bootstrap.py setup && .venv/bin/ruff check . && .venv/bin/ruff format --check .

format:
	.venv/bin/ruff format . && .venv/bin/ruff check --fix .
