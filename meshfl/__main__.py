from meshfl.app.cli import main

main()
