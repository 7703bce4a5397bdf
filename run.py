"""Entry point: ``python run.py solver=megatron cluster=dgx_8x8 model=llama2_7b``."""

from nest.app.cli import main

if __name__ == "__main__":
    main()
