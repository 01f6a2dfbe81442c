from meshfl.cli import main

main()
