module github.com/txhook/txhook/tests

go 1.26

replace github.com/txhook/txhook => ../
