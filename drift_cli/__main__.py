from drift_cli.cli import main

main()
